"""What stages are built from (not stages themselves): model loading, URL fetching and its
address guard, hashing, Hamming search, dedupe helpers, isolated video decoding and splitting."""
