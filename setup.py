"""Builds the cffi extension `agent._native` from csrc/ (cffi out-of-line API mode)."""
from setuptools import setup

setup(cffi_modules=["agent/_native_build.py:ffibuilder"])
