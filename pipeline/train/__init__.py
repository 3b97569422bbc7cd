"""Training: the finetune stage, its step mechanics (mixed precision, accumulation, checkpointing,
DDP / FSDP ranks), and the commands that time them (`train-bench`, `profile`). Nothing but the CLI
imports this package: inference never needs it."""
