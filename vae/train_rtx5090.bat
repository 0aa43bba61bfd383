@echo off
REM Train the VAE with the RTX 5090 (32 GB, Blackwell sm_120) profile. Extra arguments go to
REM vae\train_vae.py and override the profile; relative paths are read from the folder you run it in, e.g.
REM   vae\train_rtx5090.bat --data_path data\vae --output_dir runs\vae
REM   set PROFILE=max_2048 ^& vae\train_rtx5090.bat --resume_from runs\vae\checkpoint_last.pt
REM Re-running continues the run (--resume auto is added unless you pass --resume, --init_from or --overwrite).
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
set "PY=%HERE%\.venv\Scripts\python.exe"
if not exist "%PY%" set "PY=python"
if "%PYTORCH_CUDA_ALLOC_CONF%"=="" set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
if "%GPUS%"=="" set GPUS=1
if %GPUS% GTR 1 (
  "%PY%" -m torch.distributed.run --standalone --nproc_per_node %GPUS% "%HERE%\vae\train_vae.py" --config "%CONFIG%" %RESUME% %*
) else (
  "%PY%" "%HERE%\vae\train_vae.py" --config "%CONFIG%" %RESUME% %*
)
exit /b %ERRORLEVEL%
