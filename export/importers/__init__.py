"""`attnserve import`: transformers checkpoints (Marian / OPUS-MT first) turned into the model contract.

command.py reads the flags and writes the version folder; checkpoint.py reads a checkpoint folder safely;
one module per family (marian.py) maps its config, weights and tokenizer onto the contract, with the shared
pieces beside them (seq2seq_graphs.py: BART-family graphs; sentencepiece_tokenizer.py: tokenizer.json files).
"""
