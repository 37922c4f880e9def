"""safetensors out of a store and dumps (safetensors or weights-only torch.save files) into one.

See docs/INTERCHANGE.md. torch is imported only to read torch.save files: safetensors files are read
and written without it.
"""

from tracekit.interchange.export import export_file, export_tree
from tracekit.interchange.importer import import_dumps
from tracekit.interchange.layout import FileKey, parse_path

__all__ = ["FileKey", "export_file", "export_tree", "import_dumps", "parse_path"]
