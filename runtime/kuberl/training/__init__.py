"""FSDP2 training inside a role's ranks (FSDPTrainer), the models it trains, and the kernels it runs."""
