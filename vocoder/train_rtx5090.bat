@echo off
REM Train NSF-HiFiGAN with vocoder\configs\base_hifi_rtx5090_optimized.yaml (one RTX 5090, 32 GB).
REM Every argument goes to vocoder\train.py unchanged and wins over the config, e.g.
REM   vocoder\train_rtx5090.bat --data_dir data\vocoder_bin --run_dir runs\vocoder_5090
REM   vocoder\train_rtx5090.bat --data_dir data\vocoder_bin --set batch_size=24 --set max_updates=2
REM   set NPROC=2 ^& vocoder\train_rtx5090.bat --data_dir data\vocoder_bin   (torchrun DDP; gloo on Windows)
REM Relative paths are read from the folder you run it in.
REM Re-running continues the run (--resume auto is added unless you pass --resume, --init_from or --overwrite).
REM PYTHON overrides the interpreter (default .venv\Scripts\python.exe).
setlocal
set "HERE=%~dp0.."
if "%PYTHON%"=="" set "PYTHON=%HERE%\.venv\Scripts\python.exe"
if not exist "%PYTHON%" set "PYTHON=python"
set "CONFIG=%HERE%\vocoder\configs\base_hifi_rtx5090_optimized.yaml"
call "%HERE%\shell\resume_default.bat" %*
if "%PYTORCH_CUDA_ALLOC_CONF%"=="" set "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
if "%NPROC%"=="" set NPROC=1
if %NPROC% GTR 1 (
  "%PYTHON%" -m torch.distributed.run --standalone --nproc_per_node %NPROC% "%HERE%\vocoder\train.py" --config "%CONFIG%" %RESUME% %*
) else (
  "%PYTHON%" "%HERE%\vocoder\train.py" --config "%CONFIG%" %RESUME% %*
)
exit /b %ERRORLEVEL%
