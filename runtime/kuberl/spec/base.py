"""What every spec section shares: camelCase aliases, unknown fields refused, common patterns."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class Section(BaseModel):
    """Base for every spec section: camelCase aliases, unknown fields rejected, floats finite (no .inf, .nan)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", allow_inf_nan=False)
