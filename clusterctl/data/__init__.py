"""Datasets for the bundled trainer: the embedded story corpus, tokenizers, shard preparation
(`clusterctl data prepare`) and the per-rank reader / batch loader.

    corpus.py     sources: embedded stories, .txt / .jsonl files and directories, hf:NAME
    stories.py    the seeded story generator behind `embedded`
    tokenizer.py  ByteTokenizer (no downloads), HFTokenizer (a local tokenizer.json), load_tokenizer
    shards.py     prepare(), manifest.json, read_manifest(), shard_file()
    loader.py     TokenFile (mmap), TokenArray, rank_tokens(), BatchLoader

Importing this package does not import mlx; loader.py does.
"""
