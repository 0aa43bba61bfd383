@echo off
REM Makes .venv with the PyTorch build for this machine's NVIDIA driver, the pinned requirements and
REM the repository itself, then checks that torch runs on the card:
REM   setup_windows.bat                    (= --cuda auto: reads nvidia-smi)
REM   setup_windows.bat --cuda cu130       (or cu126, cu128, cpu; --dry-run prints the commands only)
REM Everything is done by shell\setup_env.py (setup_windows.bat --help). PYTHON picks the interpreter
REM (a command, e.g. set PYTHON=py -3.12); default: py -3.11, else py -3, else python.
setlocal
cd /d "%~dp0"
if not "%PYTHON%"=="" goto run
py -3.11 -c "" >nul 2>nul && (set "PYTHON=py -3.11" & goto run)
py -3 -c "" >nul 2>nul && (set "PYTHON=py -3" & goto run)
set "PYTHON=python"
:run
%PYTHON% "%~dp0shell\setup_env.py" %*
exit /b %ERRORLEVEL%
