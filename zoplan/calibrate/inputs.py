"""Checks of a calibration's inputs: the trace's plan, the plan's profile, and the
software the profile was measured with (Vidur's lesson: a newer engine drifts the
figures). Each finding is a warning, not an error."""

from __future__ import annotations

from importlib import metadata
from typing import Any

from zoplan import __version__
from zoplan.errors import ZoError
from zoplan.hardware import HardwareProfile, load_profile
from zoplan.io import sha256_json
from zoplan.plan import Plan


def this_machine_versions() -> dict[str, str | None]:
    """Installed versions (read from package metadata: torch is not imported)."""
    out: dict[str, str | None] = {"zoplan": __version__}
    for package in ("torch", "transformers"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out


def version_drift(profile: HardwareProfile) -> list[str]:
    """Packages whose version differs from the one the profile was measured with."""
    measured = (profile.extra().get("provenance") or {}).get("versions") or {}
    here = this_machine_versions()
    out = []
    for package in ("torch", "transformers", "zoplan"):
        then, now = measured.get(package), here.get(package)
        if then and now and str(then).split("+")[0] != str(now).split("+")[0]:
            out.append(f"{package} {then} -> {now}")
    return out


def check_inputs(plan: Plan, meta: dict[str, Any], profile: HardwareProfile | None) -> list[str]:
    warnings = []
    traced = meta.get("plan_sha256")
    actual = sha256_json(plan.data)
    if traced and traced != actual:
        warnings.append(f"the trace was recorded for another plan (plan sha256 {traced[:12]} "
                        f"in the trace, {actual[:12]} for this plan)")
    if profile is not None:
        if profile.sha256 != plan.data["profile"]["sha256"]:
            warnings.append(f"profile {profile.name} is not the one the plan was made with "
                            f"(sha256 {profile.sha256[:12]} != {plan.data['profile']['sha256'][:12]})")
        drift = version_drift(profile)
        if drift:
            warnings.append(f"profile {profile.name} was measured with other software "
                            f"({'; '.join(drift)}): its figures may have drifted, "
                            f"re-run `zoplan profile`")
    elif meta.get("speed_check"):
        warnings.append(f"profile {plan.data['profile']['name']!r} not found: pass --profile "
                        "with the profile file to compare the run's speed checks with it")
    return warnings


def resolve_profile(plan: Plan, name_or_path: str | None, *, required: bool) -> HardwareProfile | None:
    """--profile, else the plan's profile by name (a shipped one); None if not found and
    not required."""
    try:
        return load_profile(name_or_path or plan.data["profile"]["name"])
    except ZoError as exc:
        if required or name_or_path:
            raise ZoError(f"{exc} (pass --profile with the profile the plan was made with)") from None
        return None
