"""`zoexec run` as a torchrun worker whose node's store gets one bit flipped after a
step (RunConfig.alter_store_at, for tests): a node whose memory changed the weights.
Used by test_multinode.py: torchrun ... tests/integration/diverging_node.py NODE STEP
plan.json --out DIR ..."""

from __future__ import annotations

import sys

import zoexec.options
from zoexec import cli

NODE, STEP = int(sys.argv[1]), int(sys.argv[2])
_build = zoexec.options.build_config


def _altered(**values):
    return _build(**values).replaced(alter_store_at=(NODE, STEP))


if __name__ == "__main__":
    zoexec.options.build_config = _altered   # zoexec.cli imports it when the command runs
    sys.argv = ["zoexec", "run", *sys.argv[3:]]
    cli.main()
