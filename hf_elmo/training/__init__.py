"""Training the biLM: the corpus, its windows and streams, the trainer, the optimizer, perplexity, the warm state."""
