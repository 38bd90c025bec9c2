# Sourced by setup.sh and test.sh: MXMOE_PYTHON, the interpreter the package and its tests go
# into. The active one (a virtual environment, conda, pyenv, ...), unless it is an externally
# managed system Python (PEP 668: pip refuses to install there): then .venv, created here.
if [ -z "${MXMOE_PYTHON:-}" ]; then
  MXMOE_PYTHON=python3
  if [ -z "${VIRTUAL_ENV:-}" ] && python3 -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
    if [ ! -x .venv/bin/python ]; then
      echo "setup: the system Python is externally managed: creating .venv for the Python package"
      python3 -m venv .venv 2>/dev/null || {
        SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
        $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
        python3 -m venv .venv
      }
    fi
    MXMOE_PYTHON=$PWD/.venv/bin/python
  fi
fi
export MXMOE_PYTHON
