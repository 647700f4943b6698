"""EAGLE-3: the draft head, its config formats, the speculator and its whole-iteration loops and graphs."""
