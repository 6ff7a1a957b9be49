"""What the scripts here share with the tests, none of it shipped in the wheel: a browser
to drive (browser.py), this machine standing in for a GPU box (local_box.py) and the fixed
fleet the snapshot tests and the screenshots draw (sample.py)."""
