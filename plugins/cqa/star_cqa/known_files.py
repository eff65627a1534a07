"""The files the ``cqa`` task reads from the data root, as released (``CQATask.data_files``;
``star-engine data check``; README.md "Getting the data")."""

from star_engine import DataFile

_CQA = "CommonsenseQA v1.11, random split: https://s3.amazonaws.com/commensenseqa/{}"
_STAR = "ezelikman/STaR at 6ffd3c4: https://raw.githubusercontent.com/ezelikman/STaR/" \
        "6ffd3c4743da6c7a7369834c434359d9f7e0ac38/{}"

DATA_FILES = (
    DataFile("commonsenseqa/train_rand_split.jsonl",
             "58ffa3c8472410e24b8c43f423d89c8a003d8284698a6ed7874355dedd09a2fb",
             _CQA.format("train_rand_split.jsonl"), "MIT"),
    DataFile("commonsenseqa/dev_rand_split.jsonl",
             "3210497fdaae614ac085d9eb873dd7f4d49b6f965a93adadc803e1229fd8a02a",
             _CQA.format("dev_rand_split.jsonl"), "MIT"),
    DataFile("commonsenseqa/test_rand_split_no_answers.jsonl",
             "b426896d71a9cd064cf01cfaf6e920817c51701ef66028883ac1af2e73ad5f29",
             _CQA.format("test_rand_split_no_answers.jsonl"), "MIT"),
    DataFile("star-prompts/commonsenseqa/prompts.txt",
             "cc3d13878f5ebab64070f8a5fbb87ba5e73ddf7d2c4089129853560e98d2f3c0",
             _STAR.format("commonsenseqa/prompts.txt"), "Apache-2.0"),
    DataFile("star-prompts/commonsenseqa/prompts_answer_key.txt",
             "9d54ea1dcb78a199fb0395aefbf7e9aed0c68be995b60cc9e3bba844453c6417",
             _STAR.format("commonsenseqa/prompts_answer_key.txt"), "Apache-2.0"),
    DataFile("star-prompts/commonsenseqa/prompts_direct.txt",
             "bae4d91adf594c5f2ea0d546b8f32887bac3f195ea868a06065fb32f80eff537",
             _STAR.format("commonsenseqa/prompts_direct.txt"), "Apache-2.0"),
    DataFile("star-prompts/commonsenseqa/prompts_direct_answer_key.txt",
             "d7a873147c6e17a8475848178e705aa3b394080388ace7fd924b24b8014257bb",
             _STAR.format("commonsenseqa/prompts_direct_answer_key.txt"), "Apache-2.0"),
    # The original's licence and fine-tuning config, beside its prompt files (docs/fidelity.md).
    DataFile("star-prompts/LICENSE.txt",
             "b125aee5ee99c709297b9aafd32aa901b6e5bc71aec9ef2f45c8ac0ffce58a69",
             _STAR.format("LICENSE"), "Apache-2.0"),
    DataFile("star-prompts/qa_base.json",
             "5240056d81e1a4b6bd30d0b83c2918edbc96187b68339170e8cf9b685156bd6d",
             _STAR.format("configs/qa_base.json"), "Apache-2.0"),
)
