"""What the scripts here share with the tests: a browser to drive (browser.py) and this
machine standing in for a GPU box (local_box.py). The sample fleet is tui/sample.py."""
