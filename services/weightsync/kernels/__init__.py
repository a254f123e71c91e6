"""Bucket and tensor checksums (checksum.py), and the Triton kernels that compute them where the bytes are."""
