"""The files the ``gsm8k`` task reads from the data root, as released (``GSM8KTask.data_files``;
``star-engine data check``; README.md "Getting the data")."""

from star_engine import DataFile

_GSM8K = "GSM8K (openai/grade-school-math): https://raw.githubusercontent.com/openai/grade-school-math/" \
         "master/grade_school_math/data/{}"
_STAR = "ezelikman/STaR at 6ffd3c4: https://raw.githubusercontent.com/ezelikman/STaR/" \
        "6ffd3c4743da6c7a7369834c434359d9f7e0ac38/{}"

DATA_FILES = (
    DataFile("gsm8k/train.jsonl", "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
             _GSM8K.format("train.jsonl"), "MIT"),
    DataFile("gsm8k/test.jsonl", "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
             _GSM8K.format("test.jsonl"), "MIT"),
    DataFile("star-prompts/gsm/prompts.txt", "e0849ed3ecd08b3d93bf9a498e86477310dd398d74aca5ea9abf24ca836ab696",
             _STAR.format("gsm/prompts.txt"), "Apache-2.0"),
    DataFile("star-prompts/gsm/prompts_answer_key.txt",
             "5eaad0c7df662179278629502de3562242261cd1873d6240e67b7c4830558b38",
             _STAR.format("gsm/prompts_answer_key.txt"), "Apache-2.0"),
    DataFile("star-prompts/gsm/prompts_direct_answer_key.txt",
             "32bdfc7f35d0f15c7d0d45174e7d6a730e9f35ce6929ef5201c84ad5ce790fc9",
             _STAR.format("gsm/prompts_direct_answer_key.txt"), "Apache-2.0"),
    DataFile("star-prompts/LICENSE.txt", "b125aee5ee99c709297b9aafd32aa901b6e5bc71aec9ef2f45c8ac0ffce58a69",
             _STAR.format("LICENSE"), "Apache-2.0"),
)
