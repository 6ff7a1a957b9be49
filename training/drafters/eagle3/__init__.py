"""EAGLE-3: a one-layer drafter unrolled over TTT steps, on the verifier's three captured
layers and a draft vocabulary."""
