"""What is built on the model: embedding files, sentence embeddings, downstream task data, the model card, the Hub."""
