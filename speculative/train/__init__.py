"""`localchat train-draft`: self-distilling an EAGLE-3 head or chain-MTP layers from a target."""
