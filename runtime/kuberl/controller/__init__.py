"""The single controller: the driver's program, the Roles it drives the roles through, and their saved-state books."""
