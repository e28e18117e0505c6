"""The RLTrainingJob contract: pure pydantic, importing no torch or ray (the operator uses it)."""

from .crd import crd_yaml, generate_crd
from .errors import SpecError, SpecInvalid
from .load import apply_set, deprecations, load_manifest, manifest_with, parse_yaml, read_manifest, validate_manifest
from .model import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    ROLES,
    SHORT_NAME,
    VERSION,
    JobSpec,
    RLTrainingJob,
    RoleSpec,
    enabled_roles,
    role_resource,
)

__all__ = [
    "API_VERSION", "GROUP", "KIND", "PLURAL", "ROLES", "SHORT_NAME", "VERSION",
    "JobSpec", "RLTrainingJob", "RoleSpec", "SpecError", "SpecInvalid",
    "apply_set", "crd_yaml", "deprecations", "enabled_roles", "read_manifest", "role_resource", "generate_crd",
    "load_manifest", "manifest_with", "parse_yaml", "validate_manifest",
]
