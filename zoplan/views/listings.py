"""`zoplan models` and `zoplan profiles`: the model catalogue and the shipped profiles."""

from __future__ import annotations

from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from zoplan.errors import ZoError
from zoplan.hardware import HardwareProfile, load_profile, shipped_profiles
from zoplan.models import catalogue
from zoplan.views.common import MIB, fmt_count


def render_models(console: Console) -> None:
    """Table of the model catalogue."""
    table = Table(title="model catalogue (zoplan optimize --model NAME); sizes in fp16",
                  title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("name", "left"), ("family", "left"), ("blocks", "right"), ("hidden", "right"),
        ("params", "right"), ("block MiB", "right"), ("resident MiB", "right"))
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)
    for name, spec in catalogue().items():
        table.add_row(name, spec.family, str(spec.num_layers), str(spec.hidden),
                      fmt_count(spec.total_params), f"{spec.block_bytes('fp16') / MIB:,.1f}",
                      f"{spec.resident_bytes('fp16') / MIB:,.1f}")
    console.print(table)


def render_profiles(console: Console) -> None:
    """Table of the shipped hardware profiles; a broken one shows its error in its row."""
    table = Table(title="shipped hardware profiles (zoplan optimize --profile NAME)",
                  title_justify="left")
    for name in ("name", "device", "GPUs", "GPU GiB", "H2D GB/s", "fabric GB/s", "host GiB"):
        table.add_column(name, justify="left" if name in ("name", "device", "fabric GB/s")
                         else "right", no_wrap=True, overflow="ellipsis",
                         max_width=16 if name in ("name", "device") else None)
    broken = []
    for name, path in shipped_profiles().items():
        try:
            table.add_row(*_profile_row(load_profile(path)))
        except (ZoError, ValueError, TypeError, KeyError) as exc:
            table.add_row(name, Text("broken (see below)", style="red"), "", "", "", "", "")
            broken.append(f"{name}: {exc}")
    if not table.rows:
        table.add_row("(none)", "", "", "", "", "", "")
    console.print(table)
    for line in broken:
        console.print(Text(f"broken profile {line}", style="red"), soft_wrap=True)


def _profile_row(profile: HardwareProfile) -> tuple[str, ...]:
    data = profile.to_dict()   # the file's figures, shown (zoplan.hardware.DATA_READERS)
    device, fabric = data["device"], data["fabric"]
    return (profile.name, str(device.get("model") or device["kind"]),
            str(profile.gpus_per_node), f"{device['memory_gib']:.0f}",
            f"{data['pcie']['h2d_gbps']:g}", f"{fabric['kind']} {fabric['p2p_gbps']:g}",
            f"{data['host']['memory_gib']:.0f}")
