"""The transfer library: plan a version into buckets, pack and send them, receive, verify and unpack them."""
