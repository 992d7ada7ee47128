"""`hf-elmo perplexity`: forward, backward and mean perplexity of a trained biLM on text files (`perplexity_bilm`)."""

from dataclasses import dataclass

from ..input_checks import device_option
from ..training.corpus import MODEL_SPLIT_HELP, SPLITS, model_split
from ..training.perplexity import STARTS, compute_perplexity, load_bilm, sentence_perplexity, stream_perplexity
from .command_line import ExclusiveOptions, option
from .launch import check_one_process
from .threads import HELP as THREADS_HELP
from .threads import use_threads

MODE = ExclusiveOptions()


@dataclass(kw_only=True)
class PerplexityOptions:
    model: str = option(help="folder written by hf-elmo train or convert --tf-checkpoint")
    files: list[str] = option(help="text files, one sentence per line", positional=True)
    stream: bool = option(
        False,
        help="bilm-tf's test(): --batch-size continuous streams, the state never reset, the last incomplete batch "
        "dropped",
        flag=True,
        exclusive=MODE,
    )
    start: str | None = option(
        None, help="score every line on its own from the zero or the warm state", choices=STARTS, exclusive=MODE
    )
    window: int = option(20, help="positions per window, as in training")
    split: str | None = option(None, help=MODEL_SPLIT_HELP, choices=SPLITS)
    batch_size: int = option(64, help="windows, lines or streams per batch")
    device: str | None = option(None, help="torch device, e.g. cpu or cuda:0 (default: cuda if available)")
    threads: int | None = option(None, help=THREADS_HELP)


COMMAND_OPTIONS = PerplexityOptions


def run(options) -> int:
    """`options`: the fields of `PerplexityOptions`, as parsed."""
    check_one_process("perplexity")
    use_threads(options.threads)
    device = device_option(options.device)
    split = model_split(options.model, options.split)
    model, tokenizer = load_bilm(options.model, device)
    if options.stream:
        result = stream_perplexity(model, tokenizer, options.files, options.batch_size, split)
    elif options.start:
        result = sentence_perplexity(model, tokenizer, options.files, options.start, options.batch_size, split)
    else:
        result = compute_perplexity(model, tokenizer, options.files, options.window, split, options.batch_size)
    print(f"text split             {split}")
    print(f"targets per direction  {result['targets']:,}")
    print(f"forward perplexity     {result['forward']:.3f}")
    print(f"backward perplexity    {result['backward']:.3f}")
    print(f"geometric mean         {result['geometric_mean']:.3f}")
    return 0
