"""The Textual chat UI of localchat (and, on main, its command line)."""
