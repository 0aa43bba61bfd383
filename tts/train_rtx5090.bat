@echo off
rem Uzbek VITS on one RTX 5090 (Windows). Every argument goes to tts\train.py unchanged; relative paths
rem are read from the folder you run it in:
rem   tts\train_rtx5090.bat --data_dir data\preprocessed --run_dir runs\uzbek_vits_rtx5090 [--set k=v ...]
rem Re-running continues the run (--resume auto is added unless you pass --resume, --init_from or --overwrite).
rem   set NPROC=2 ^& tts\train_rtx5090.bat ...   (torchrun DDP; gloo on Windows)
rem PYTHON overrides the interpreter (default .venv\Scripts\python.exe).
setlocal
set "HERE=%~dp0.."
if "%PYTHON%"=="" set "PYTHON=%HERE%\.venv\Scripts\python.exe"
if not exist "%PYTHON%" set "PYTHON=python"
call "%HERE%\shell\resume_default.bat" %*
set "CONFIG=%HERE%\tts\vits\configs\uzbek_vits_rtx5090.yaml"
if "%NPROC%"=="" set NPROC=1
if %NPROC% GTR 1 (
  "%PYTHON%" -m torch.distributed.run --standalone --nproc_per_node %NPROC% "%HERE%\tts\train.py" --config "%CONFIG%" %RESUME% %*
) else (
  "%PYTHON%" "%HERE%\tts\train.py" --config "%CONFIG%" %RESUME% %*
)
exit /b %ERRORLEVEL%
