"""The LightningModules (MemPOModule, SFTModule) and their callbacks (sampler, checkpoints, validation)."""
