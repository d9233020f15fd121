"""Training side (``agl_bridge.trainer``): transitions, losses, the LoRA trainer, publishing.

Modules import torch only where they need it, so ``agl_bridge.trainer.conversion.engine`` works with
the core install.
"""
