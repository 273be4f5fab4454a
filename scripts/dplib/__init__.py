"""What the scripts share: the repository root, the Transformer presets, the bootstrap interval of a median,
and reading results files and traces. Standard library only at import (numpy and scipy are imported by
median_ci alone), so any Python may import it: Debian's, or the pip torch 2.x venv's that runs the peers.

    dplib            this file
    dplib.trace      the trace model: steps, phases and collectives per rank (timeline, trace_overlap, figures)
    dplib.gtest      GoogleTest's --gtest_list_tests listing, parsed (check_labels, workbook)

A script in a folder of scripts/ imports it with
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    import dplib  # noqa: E402
"""
import functools
import gzip
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository root
RESULTS = ROOT / "docs" / "results"

# ---- the Transformer presets -----------------------------------------------------------------------------
# common/model/transformer.cpp, kPresets: name -> (d_model, d_ff, num_layers, num_heads); vocabulary 10,000.
# ctest Accounting.MatchesScript (tests/common/test_models.cpp) checks every one against the C++ preset of
# that name, through scripts/pages/accounting.py --json.
PRESETS = {
    "tiny": (256, 1024, 4, 4),
    "small": (768, 3072, 12, 12),
    "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20),
    "xl": (1600, 6400, 48, 25),
    "2.7b": (2560, 10240, 32, 32),
}
VOCAB = 10000


def num_parameters(d_model, d_ff, num_layers, vocab=VOCAB):
    """TransformerConfig::num_parameters: 2 V d + L (4 d^2 + 3 d d_ff + 2 d) + d (embedding and untied lm_head,
    per block attention, SwiGLU and two norms, the final norm)."""
    return 2 * vocab * d_model + num_layers * (4 * d_model * d_model + 3 * d_model * d_ff + 2 * d_model) + d_model


def check_preset_args(ap, a, positive):
    """For a driver's parsed options `a`: lower-cases a.preset and refuses (ap.error, exit 2) a preset that is
    not in PRESETS or any option named in `positive` that is not above 0, in the C++ programs' words."""
    a.preset = a.preset.lower()
    if a.preset not in PRESETS:
        ap.error(f"unknown model size '{a.preset}'; valid sizes: {', '.join(PRESETS)}")
    for name in positive:
        if getattr(a, name) <= 0:
            ap.error(f"--{name} must be positive, got {getattr(a, name)}")


# ---- statistics ------------------------------------------------------------------------------------------
def median_ci(samples):
    """(median, low, high): the median and its 95% percentile-bootstrap interval (scipy.stats.bootstrap, 9999
    resamples, seed 0, so that the pages are reproducible); low and high are None for fewer than 3 samples,
    where a bootstrap has too few distinct resamples to mean anything."""
    import numpy as np
    from scipy import stats
    x = np.asarray(samples, dtype=float)
    med = float(np.median(x)) if len(x) else float("nan")
    if len(x) < 3:
        return med, None, None
    if np.ptp(x) == 0:  # every resample has the same median; scipy would warn about a degenerate sample
        return med, med, med
    res = stats.bootstrap((x,), np.median, confidence_level=0.95, n_resamples=9999, method="percentile",
                          random_state=np.random.default_rng(0), vectorized=True, axis=-1)
    return med, float(res.confidence_interval.low), float(res.confidence_interval.high)


# ---- results files and traces ----------------------------------------------------------------------------
def load_json(path):
    """A JSON file (a results file, a loss curve), parsed."""
    return json.loads(pathlib.Path(path).read_text())


@functools.lru_cache(maxsize=None)
def results(name):
    """docs/results/NAME.json, parsed once per run (make_tables reads the same files many times; callers only
    read it)."""
    return load_json(RESULTS / f"{name}.json")


def trace_events(path):
    """The events of a Chrome trace-event file (`--trace FILE`), plain or gzipped as bench_docs.sh keeps them
    (NAME.json.gz): the "traceEvents" list of the object, or the bare array (legal too); None when an object
    has no such list. Raises OSError, EOFError, UnicodeDecodeError or json.JSONDecodeError on a bad file."""
    path = str(path)
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        doc = json.load(f)
    return doc.get("traceEvents") if isinstance(doc, dict) else doc
