"""Loads the C++ module, and refuses one built for another torch with a message that says how to rebuild it."""
import importlib

import torch

REBUILD = "pip install --force-reinstall --no-deps ./python (in the ddp_from_scratch checkout, with this Python)"


def load_module():
    # A C++ extension loads only into the torch it was compiled against (LibTorch has no stable ABI): compare the
    # versions first, so a mismatch reads as one, not as an undefined symbol.
    built = importlib.import_module(__package__ + "._build_info").TORCH_VERSION
    running = torch.__version__
    if built != running:
        raise ImportError(f"ddp_from_scratch was built against torch {built}, but this Python imports torch {running}. "
                          f"Rebuild it for this torch: {REBUILD}")
    try:
        return importlib.import_module(__package__ + "._C")
    except ImportError as e:
        raise ImportError(f"ddp_from_scratch's C++ module (built for torch {built}) does not load: {e}. "
                          f"Rebuild it for this torch: {REBUILD}") from e
