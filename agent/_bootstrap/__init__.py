"""Folder that `argus run` puts on PYTHONPATH: holds only ``sitecustomize``."""
