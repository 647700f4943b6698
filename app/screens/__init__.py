"""Full screens and modal dialogs of the chat UI."""
