@echo off
rem Uzbek VITS on one RTX 5090 (Windows). Every argument goes to tts\train.py unchanged:
rem   tts\train_rtx5090.bat --data_dir data\preprocessed --run_dir runs\uzbek_vits_rtx5090 [--resume auto] [--set k=v ...]
rem PYTHON overrides the interpreter (default .venv\Scripts\python.exe).
setlocal
set "HERE=%~dp0.."
if "%PYTHON%"=="" set "PYTHON=%HERE%\.venv\Scripts\python.exe"
if not exist "%PYTHON%" set "PYTHON=python"
cd /d "%HERE%"
"%PYTHON%" tts\train.py --config tts\configs\uzbek_vits_rtx5090.yaml %*
exit /b %ERRORLEVEL%
