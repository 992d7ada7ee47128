"""Convert an original ELMo (`options.json` + `weights.hdf5`) to a Hugging Face folder.

    python conversion/convert_original_elmo.py --options OPTIONS.json --weights WEIGHTS.hdf5 --output-dir OUT

The same as `hf-elmo convert` (`hf_elmo/commands/convert.py`); the weight mapping is
`hf_elmo/convert/original_format.py`.
"""

import sys

from hf_elmo.commands.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", *sys.argv[1:]]))
