"""Builds torch_axon._C with CMake (the same build `make` runs) before packaging.

Install against the installed torch: pip install --no-build-isolation -e .
"""

import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


class BuildWithCMake(build_py):
    def run(self):
        build = os.environ.get("AXON_BUILD_DIR", os.path.join(ROOT, "build"))
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-G", "Ninja",
                               f"-DPython3_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", build, "--target", "axon_C"])
        super().run()


setup(cmdclass={"build_py": BuildWithCMake})
