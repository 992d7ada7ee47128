"""`hf-elmo warm-state`: estimate a model's warm start state from text (`warm_state.estimate_warm_state`) and store it
in the model folder."""

from dataclasses import dataclass

from ..input_checks import device_option
from ..modeling_elmo import ElmoModel
from ..pretrained_elmo import load_model_folder
from ..tokenization_elmo import ElmoTokenizer
from ..training.corpus import MODEL_SPLIT_HELP, SPLITS, model_split
from ..training.warm_state import DEFAULT_SENTENCES, estimate_warm_state, read_sentences, store_warm_state
from .command_line import option
from .threads import HELP as THREADS_HELP
from .threads import use_threads

HELP = "estimate a warm start state from text and store it in a model folder"


@dataclass(kw_only=True)
class WarmStateOptions:
    model: str = option(help="model folder (hf-elmo convert / train / save_pretrained)")
    files: list[str] = option(help="text files, one sentence per line (in-domain text is best)", positional=True)
    sentences: int = option(DEFAULT_SENTENCES, help="use the first N sentences")
    split: str | None = option(None, help=MODEL_SPLIT_HELP, choices=SPLITS)
    device: str | None = option(None, help="torch device, e.g. cpu or cuda:0 (default: cuda if available)")
    threads: int | None = option(None, help=THREADS_HELP)


COMMAND_OPTIONS = WarmStateOptions


def run(options) -> int:
    """`options`: the fields of `WarmStateOptions`, as parsed."""
    use_threads(options.threads)
    device = device_option(options.device)
    split = model_split(options.model, options.split)
    model = load_model_folder(ElmoModel, options.model).to(device)
    tokenizer = ElmoTokenizer.from_pretrained(options.model)
    sentences = read_sentences(options.files, options.sentences, split, tokenizer)
    store_warm_state(options.model, estimate_warm_state(model, sentences, tokenizer))
    print(f"Warm start state from {len(sentences):,} sentences written to {options.model}")
    return 0
