"""English constituency parsing (section 6.3): Penn Treebank trees, their linearization, repair and EVALB scores."""
