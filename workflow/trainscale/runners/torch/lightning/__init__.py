"""`lightning-ddp`: Lightning's own loop (`ddp`: Trainer(strategy="ddp") under torchrun) fed the
torch loop's batches in its order (`data`)."""
