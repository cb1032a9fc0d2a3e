"""Imported by Python at start-up in every child process the tests start with tests/ on PYTHONPATH: the faults
those tests ask for through the environment (see fault_injection.py); nothing when none is asked for."""

import fault_injection

fault_injection.install()
