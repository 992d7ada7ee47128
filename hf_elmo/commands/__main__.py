"""`python -m hf_elmo.commands ...` (what `torchrun -m` and `accelerate launch -m` start): the `hf-elmo` command."""

import sys

from .cli import main

sys.exit(main())
