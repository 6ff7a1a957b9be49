"""The DFlash drafter: a block-diffusion drafter that fills a block of mask tokens after a
clean anchor in one non-causal pass, reading several verifier layers as context."""
