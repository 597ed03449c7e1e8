"""Speed data structures behind small interfaces, each proven by a plain twin: a dict of small
int keys in one array (``dense_map``) and typed runs of ints numpy reads in place (``int_runs``)."""
