"""Speed paths: attention masks and varlen attention, padding-free layers, packed dropout, compile,
memory, hardware probes, glibc's malloc."""
