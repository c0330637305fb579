"""Unit tests import the collection as Ansible does: ansible_collections.gpuops.reclaim.

`make collection-link` creates .build/collections/ansible_collections/gpuops/reclaim -> repo root.
"""
import os
import sys

COLLECTIONS = os.path.join(os.path.dirname(__file__), '..', '..', '.build', 'collections')
sys.path.insert(0, os.path.abspath(COLLECTIONS))
