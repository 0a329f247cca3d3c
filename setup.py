# Kept so that `python setup.py develop` (what VOLTA's README tells users to run) still works.
from setuptools import setup

setup()
