"""What every spec section shares: camelCase aliases, unknown fields refused, common patterns."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class Section(BaseModel):
    """Base for every spec section: camelCase aliases, unknown fields rejected, floats finite (no .inf, .nan),
    and strict types: an integer field takes an integer only (not true, 2.0 or "2"), a number field an integer or
    a float (not "1e-3"), a string field a string (not 5), a boolean field true or false (not "yes")."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", allow_inf_nan=False,
                              strict=True)
