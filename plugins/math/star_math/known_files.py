"""The files the ``math`` task reads from the data root (``MATHTask.data_files``; ``star-engine
data check``; README.md "Getting the data"). Neither has one content to check: ``math/train.jsonl``
is made from MATH's release with ``jq`` (README.md of this plugin), and MATH-500's ``test.jsonl``
is taken as the Hugging Face dataset serves it; only their presence is checked."""

from star_engine import DataFile

DATA_FILES = (
    DataFile("math/train.jsonl", None,
             "MATH (hendrycks/math) train split, one line per problem made with jq (plugins/math/README.md)", "MIT"),
    DataFile("math500/test.jsonl", None,
             "MATH-500: https://huggingface.co/datasets/HuggingFaceH4/MATH-500 (test.jsonl; PRM800K's test subset, "
             "openai/prm800k)", "none stated on its card; PRM800K (openai/prm800k) and MATH are MIT"),
)
