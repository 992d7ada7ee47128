"""The `hf-elmo` command line: each module is one command (`hf-elmo COMMAND --help`); the model imports none of them."""
