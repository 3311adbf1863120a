"""zoplan: plan zeroth-order fine-tuning of models streamed from host memory.

Importing this package never imports torch: planning runs on any machine.
"""

__version__ = "0.1.0"
