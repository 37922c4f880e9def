"""JSON Schemas of the store metadata and the diff report."""
