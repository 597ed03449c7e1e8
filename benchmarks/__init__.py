"""Speed and memory benchmarks (``make bench``): numbers, not pass/fail."""
