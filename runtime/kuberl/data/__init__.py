"""What a step's samples are made of: the Batch, the prompt and eval sources, the tokenized prompt batches."""
