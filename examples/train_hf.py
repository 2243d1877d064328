"""A Hugging Face causal LM (tiny random Llama, built locally) trained with planned context parallelism.

    torchrun --nproc-per-node 4 examples/train_hf.py --steps 10 --reference
    torchrun --nproc-per-node 6 examples/train_hf.py --steps 10 --service http://127.0.0.1:8000

The same as ``torchrun ... -m trainer.train_hf``; see that module (``--help``) for the options.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainer.train_hf import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
