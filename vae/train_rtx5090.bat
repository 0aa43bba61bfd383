@echo off
REM Train the VAE with the RTX 5090 (32 GB, Blackwell sm_120) profile. Extra arguments go to
REM vae\train_vae.py and override the profile; relative paths are read from the folder you run it in, e.g.
REM   vae\train_rtx5090.bat --data_path data\vae --output_dir runs\vae
REM   set PROFILE=max_2048 ^& vae\train_rtx5090.bat --resume_from runs\vae\checkpoint_last.pt
REM Re-running continues the run (--resume auto is added unless you pass --resume, --init_from or --overwrite).
REM   set NPROC=2 ^& vae\train_rtx5090.bat --data_path data\vae   (torchrun DDP; gloo on Windows)
REM PYTHON overrides the interpreter (default .venv\Scripts\python.exe).
REM Profiles: fast_768, standard_1024 (default), high_1536, max_2048, large_channel_z32 (vae\configs\).
setlocal
set "HERE=%~dp0.."
call "%HERE%\shell\resume_default.bat" %*
if "%PROFILE%"=="" set PROFILE=standard_1024
set "CONFIG=%HERE%\vae\configs\%PROFILE%.yaml"
if not exist "%CONFIG%" (
  echo error: no profile %PROFILE% ^(%CONFIG%^) 1>&2
  exit /b 2
)
if "%PYTHON%"=="" set "PYTHON=%HERE%\.venv\Scripts\python.exe"
if not exist "%PYTHON%" set "PYTHON=python"
if "%PYTORCH_CUDA_ALLOC_CONF%"=="" set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
if "%NPROC%"=="" set NPROC=1
if %NPROC% GTR 1 (
  "%PYTHON%" -m torch.distributed.run --standalone --nproc_per_node %NPROC% "%HERE%\vae\train_vae.py" --config "%CONFIG%" %RESUME% %*
) else (
  "%PYTHON%" "%HERE%\vae\train_vae.py" --config "%CONFIG%" %RESUME% %*
)
exit /b %ERRORLEVEL%
